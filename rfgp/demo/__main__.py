"""``python -m rfgp.demo [output_dir] [--only NAME ...]``: the end-to-end demo
(:func:`rfgp.demo.main`), or only the examples named."""

import argparse

from rfgp.demo import EXAMPLES, main

parser = argparse.ArgumentParser(prog="python -m rfgp.demo",
                                 description="Run rfgp's examples and print one summary table.")
parser.add_argument("output_dir", nargs="?", default="demo_output",
                    help="folder for the plots (default: demo_output)")
parser.add_argument("--only", nargs="+", choices=EXAMPLES, metavar="NAME",
                    help=f"run only these examples ({', '.join(EXAMPLES)})")
args = parser.parse_args()
main(args.output_dir, args.only)
