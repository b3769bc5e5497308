"""palladium.interpret.observe: who hears what a launch does: observers, logging modes, progress reports."""
