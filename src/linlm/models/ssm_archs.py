"""Registry entries for the SSM architectures (Mamba, MossNet). Filled in by the MossNet work."""
