"""The image family's experiment: class-conditional image generation (DiT / SiT / DiPoM / SiPoM): image folders and
digits, train / sample / eval, the image bench."""
