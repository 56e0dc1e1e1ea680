"""Weight quantization: FP8 linear layers (``LLM(quantization="fp8")``, or a pre-quantized FP8 checkpoint).

``config.py`` reads what is asked and what the checkpoint says (torch-free, for the command line);
``fp8.py`` holds ``Fp8Linear`` and the loading of its weights and scales (pacore_kernels/fp8_gemm.py computes).
"""
