"""The compiled step and its loop: towers, variable modes, loss scaling, precision, scopes."""
