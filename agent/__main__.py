from agent.cli.main import main

main()
