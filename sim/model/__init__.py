"""The model as one replica holds it: per-GPU shapes of each layer kind and the layers of each
pipeline stage (``layout``), derived once for the cost model and the memory budget alike, and
its parameters and their bytes per GPU (``weights``)."""
