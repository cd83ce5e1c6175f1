"""The remote backend: where a sandbox lives, below the seam (docs/architecture.md)."""
