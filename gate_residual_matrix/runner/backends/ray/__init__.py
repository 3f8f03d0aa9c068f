"""The Ray backend: the selected cells on a Ray cluster's nodes (``--cluster ADDRESS``)."""
