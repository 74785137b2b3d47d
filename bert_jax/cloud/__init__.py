"""Cloud TPU: slice names and topologies (tpu), ahead-of-time compilation of a run for a
slice with its memory and time (plan), and pod runs through queued resources (launch). It
may import training, tasks, models, data, config and the base modules; nothing in the
library below the command line (commands) imports it.
"""
