//! solder's model layers: weights, emitters, programs and sessions (issue 3).
