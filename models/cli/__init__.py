"""The model commands: ``anychip generate``, ``anychip chat`` and ``anychip models``."""
