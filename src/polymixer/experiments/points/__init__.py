"""The points family's experiment: point-cloud segmentation (PTv3 / PPoMv3 / hybrid): ScanNet, SemanticKITTI, .ply
and the synthetic rooms, train / eval, the points bench."""
