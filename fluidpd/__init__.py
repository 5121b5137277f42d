"""FluidPD: prefill/decode disaggregated LLM serving with in-place elasticity."""
