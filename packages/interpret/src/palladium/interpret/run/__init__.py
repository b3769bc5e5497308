"""palladium.interpret.run: one launch: its memory map, the grid loop, the order of its grid points and DMAs, Ctrl-C, one BLAS thread."""
