"""The graph-building toolkit: the build context, shared components and attention lowerings."""
