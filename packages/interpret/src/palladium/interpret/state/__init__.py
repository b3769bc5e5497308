"""palladium.interpret.state: everything kept per process (`STATE`) and the classes it holds."""
