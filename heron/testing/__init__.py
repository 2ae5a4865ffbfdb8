"""Test doubles that speak real protocols: fake model servers on 127.0.0.1 and a scripted
provider. Shipped in the package so benchmarks and users' own tests can use them too."""
