"""VeRL backend: the verl 0.9.1 plugin, job builder, data preparation and reward."""
