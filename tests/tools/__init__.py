"""The built-in tools, proven on real files, real symlinks and real processes."""
