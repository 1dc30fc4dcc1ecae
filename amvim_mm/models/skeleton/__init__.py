"""What every backbone family shares: the backbone base (:mod:`.base`), CUDA-graph replay
(:mod:`.graphs`), the input check, the checkpoint guard, the arch resolver, the patch
embedding, layer decay and argument checks."""
