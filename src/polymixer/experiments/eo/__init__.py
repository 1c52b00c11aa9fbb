"""The eo family's experiment: satellite image time series segmentation (TSViT / TSViPoM / hybrid): PASTIS and its
synthetic stand-in, train / eval, the satellite bench."""
