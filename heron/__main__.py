from heron.entry import main

main()
