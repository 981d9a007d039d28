"""The command line (`dpeer ...`) and the demo's live screen: the top layer, it may use every other."""
