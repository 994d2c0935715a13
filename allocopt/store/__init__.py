"""The study's store, shared by its workers: opening the Optuna storage (``connect``), waiting out
a server that goes away (``reconnect``), the storage behind each opened study (``handles``), a
worker's heartbeat on its trials (``heartbeat``), settling what stopped workers left
(``settle``), claims that keep two workers off one point (``claims``), and one worker per GPU
(``launch``)."""
