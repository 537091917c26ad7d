"""anychip's built-in chip plugins. Each registers through the ``anychip.plugins`` entry points
declared in setup.py, exactly as a third-party plugin package would."""
