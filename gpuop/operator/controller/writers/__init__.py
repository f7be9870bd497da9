"""Writers: everything that talks to the API server or a registry: its writes, and the
reads no cache holds."""
