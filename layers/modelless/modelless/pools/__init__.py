"""Worker pools: the hardware kinds (catalog), and how queries reach workers and the Lambda tier."""
