"""anychip's built-in chip plugins, one package each (cpu, gpu, xpu, npu, gcu, dcu). Each registers
through the ``anychip.plugins`` entry points declared in setup.py, exactly as a third-party plugin
package would. ``host`` is no plugin: the host kernels that cpu and the simulated chips share."""
