"""``python -m jemeval`` (used by torchrun: ``torchrun ... -m jemeval train ...``)."""
from jemeval.cli import main

if __name__ == "__main__":
    main()
