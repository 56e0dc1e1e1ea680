"""Running the model: the decoder, attention metadata, weight loading, the KV cache, the model runner and its CUDA graphs, the tensor-parallel worker processes."""
