"""Generated models: architectures as data (``arch``), Hypothesis strategies, and the properties
every generated model must satisfy."""
