#!/usr/bin/env python3
"""Creates a SCRAM-SHA-256 and a SCRAM-SHA-512 credential for one user on the TLS broker
(scripts/kafka-secure.sh), through the Kafka API, with confluent-kafka's AdminClient.

usage: kafka-scram-users.py CA_FILE USER PASSWORD
"""
import sys

from confluent_kafka.admin import (AdminClient, ScramCredentialInfo, ScramMechanism,
                                   UserScramCredentialUpsertion)

ca, user, password = sys.argv[1:4]
admin = AdminClient({
    "bootstrap.servers": "localhost:9093",
    "broker.address.family": "v4",
    "security.protocol": "SSL",
    "ssl.ca.location": ca,
})
upserts = [
    UserScramCredentialUpsertion(user, ScramCredentialInfo(mech, 4096), password.encode())
    for mech in (ScramMechanism.SCRAM_SHA_256, ScramMechanism.SCRAM_SHA_512)
]
for name, fut in admin.alter_user_scram_credentials(upserts, request_timeout=20).items():
    fut.result()
    print(f"SCRAM credentials for {name}: created")
