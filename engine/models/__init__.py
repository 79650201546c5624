"""Model families. Each family is a spec reader's companion: its logical weights and its
graph, built from the plan."""
