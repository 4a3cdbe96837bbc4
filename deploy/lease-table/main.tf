# The kcl lease table, as kcl's TableSetup::Managed would create it, for fleets whose tables
# are made by infrastructure as code: run the workers with TableSetup::External
# (`--table-setup external` / KCL_TABLE_SETUP=external) and the policy
# deploy/iam-policy-external-table.json. Layout: docs/lease-table.md.
#
#   terraform init && AWS_REGION=eu-west-1 terraform apply -var application_name=orders-consumer
#
# Or use this directory as a module: module "lease_table" { source = "./deploy/lease-table"
# application_name = "orders-consumer" } (the provider and its region come from the caller).
#
# What kcl itself would create: hash key `leaseKey` (S), on-demand billing, the
# `LeaseOwnerToLeaseKeyIndex` index (`leaseOwner` HASH, `leaseKey` RANGE, keys only) and a
# NEW_IMAGE stream (the last two are used by `coordination = leader`, the default).
# Added here, not by kcl: point-in-time recovery, deletion protection and prevent_destroy,
# because the table holds every checkpoint of the application.

terraform {
  required_version = ">= 1.3"
  required_providers {
    aws = {
      source  = "hashicorp/aws"
      version = ">= 5.0"
    }
  }
}

variable "application_name" {
  description = "The application name (kcl's application-name, KCL Java's applicationName); the lease table is named after it."
  type        = string

  validation {
    condition     = can(regex("^[a-zA-Z0-9_.-]{3,255}$", var.application_name))
    error_message = "A DynamoDB table name: 3 to 255 of a-z A-Z 0-9 _ - ."
  }
}

variable "tags" {
  description = "Tags for the table."
  type        = map(string)
  default     = {}
}

resource "aws_dynamodb_table" "lease_table" {
  name     = var.application_name
  hash_key = "leaseKey"

  # As kcl and KCL Java create it. For provisioned capacity, set billing_mode = "PROVISIONED"
  # with read_capacity / write_capacity on the table and on the index (kcl gives the index the
  # table's capacity).
  billing_mode = "PAY_PER_REQUEST"

  attribute {
    name = "leaseKey"
    type = "S"
  }

  attribute {
    name = "leaseOwner"
    type = "S"
  }

  global_secondary_index {
    name            = "LeaseOwnerToLeaseKeyIndex"
    hash_key        = "leaseOwner"
    range_key       = "leaseKey"
    projection_type = "KEYS_ONLY"
  }

  stream_enabled   = true
  stream_view_type = "NEW_IMAGE"

  # IaC defaults, not kcl's: recover from a bad manual edit, and refuse DeleteTable.
  point_in_time_recovery {
    enabled = true
  }
  deletion_protection_enabled = true

  tags = var.tags

  lifecycle {
    # Destroying the table loses every checkpoint: remove this line on purpose first.
    prevent_destroy = true
  }
}

output "table_name" {
  description = "The lease table (= the application name)."
  value       = aws_dynamodb_table.lease_table.name
}

output "table_arn" {
  description = "For the IAM policies' lease-table statements."
  value       = aws_dynamodb_table.lease_table.arn
}

output "stream_arn" {
  description = "The lease table's stream, followed by the leader and the standby."
  value       = aws_dynamodb_table.lease_table.stream_arn
}
