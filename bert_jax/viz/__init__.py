"""Pictures: training curves of one or more workdirs and the sweep figure (plots), and
attention maps of a checkpoint as PNG, JSON and an HTML viewer (attention_maps). It may import
training, translation, tasks, models, data, config and the base modules; only the command line
(commands, the sweep's results.png too) imports it.
"""
