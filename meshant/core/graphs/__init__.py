"""Task graphs: the model (a graph document checked and its node specs) and the book of the
graphs that run."""
