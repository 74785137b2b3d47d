"""Input pipelines: tokenization and feature building for BERT."""
