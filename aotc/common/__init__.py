"""What the build side and the runtime share: the pointer ABI, variants, artifacts, the cubin reader,
typed errors, environment configuration and producer versions. Standard library only: nothing here
imports cutlass, cuda or torch."""
