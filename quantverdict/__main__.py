from quantverdict.run.cli import script

script()
