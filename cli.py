"""`python cli.py ...` from a checkout runs the `evonnx` command (the same as the installed `evonnx` script); the
command line itself is `evonnx/cli.py`."""

from evonnx.cli import main

if __name__ == "__main__":
    main()
