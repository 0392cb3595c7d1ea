"""CuTe DSL kernel sources, one module per family; imported only to compile."""
