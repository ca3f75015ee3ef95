"""``python -m rfgp.demo [output_dir]``: the end-to-end demo (:func:`rfgp.demo.main`)."""

import sys

from rfgp.demo import main

main(*sys.argv[1:2])
