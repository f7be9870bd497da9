"""Pure operand definitions: target nodes, desired objects, readiness. No I/O."""
