"""The face of specroute: the `specroute` command (cli.py) and the demo that chains the stages
(demo.py, with its time estimate in estimate.py). The stages (data_gen, train, eval) and the core
(router) never import this package; it reaches the stages only through their run functions and
config objects."""
