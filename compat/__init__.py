"""Start-up hooks for library gaps, imported by every process of the venv from a `.pth` line that
`make setup` writes (so vLLM's and Ray's subprocesses get them too). Each module says which gap it
covers, for which versions, and which test tells when it can go. Imports nothing of omniray's."""
