"""palladium.interpret.kernel.prepared_kernel: what is known of one `pallas_call` before it runs: its jaxpr's checks, blocks and grid."""
