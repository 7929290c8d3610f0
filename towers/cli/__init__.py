"""The command-line tools: thin layers over the library."""
