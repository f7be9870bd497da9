"""The node agent: validator and node status exporter, run on every GPU node."""
