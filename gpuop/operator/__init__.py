"""The operator program (`gpuop run`): the process (`app`), the controller, leader
election, metrics, health, events and the HTTP server. It never imports the node agent
or the development cluster (contracts `programs-independent`,
`programs-without-devcluster`)."""
