from heron.cli import main

main()
