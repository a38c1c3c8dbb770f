"""Performance per commit: the history database, the noise-aware compare and the HTML report."""
