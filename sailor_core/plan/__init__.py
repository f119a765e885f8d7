"""The plan (one format for CLI, planner, simulator and engine), its rank layout and routing."""
