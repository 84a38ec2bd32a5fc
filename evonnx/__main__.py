"""`python -m evonnx` runs the command-line interface."""

from evonnx.cli import main

main()
