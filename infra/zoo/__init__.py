"""Model zoos trained here (nothing is downloaded): the digits demo zoo and the cost study's heavy model."""
