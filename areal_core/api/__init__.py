"""The plugin API: the one part of areal_core that plugins import."""
