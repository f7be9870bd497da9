"""Pure ClusterPolicy models and the CRD generated from them. No I/O."""
