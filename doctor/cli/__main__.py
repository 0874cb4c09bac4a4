from doctor.cli.main import main

main()
