"""What the notebooks call (``helpers``, ``plotting``, ``eval_figures``, ``viewer``) and how the
notebook series is run (``series``, its parameters checked by ``series_params``)."""
